// pip requirements: the grammar (daemon/venv/requirements.h), Letta's two
// shapes, the canonical set and the venv key made of it.
#include "daemon/venv/requirements.h"

#include <gtest/gtest.h>

namespace {

using tsb::venv::canonical_set;
using tsb::venv::parse_requirement;
using V = tsb::venv::Verdict;
using nlohmann::json;

TEST(VenvRequirements, Grammar) {
  for (const char* ok : {"requests", "requests==2.32.3", "requests[socks]>=2.31,<3", "numpy (==1.26.4)", "a", "zope.interface",
                         "foo_bar-baz~=1.0", "pkg!=1.*", "x >= 1 , < 2", "Django===4.2", "pkg[a,b]", " padded "})
    EXPECT_EQ(parse_requirement(ok, false).verdict, V::Ok) << ok << ": " << parse_requirement(ok, false).reason;
  for (const char* bad : {"--index-url=http://x", "-r requirements.txt", " -e .", "git+https://x/y.git", "pkg @ https://x/y.whl",
                          "./local", "/abs/path", "~/x", "dir/pkg", "-", "--only-binary=:none: x"})
    EXPECT_EQ(parse_requirement(bad, false).verdict, V::Forbidden) << bad;
  for (const char* bad : {"", "requests; os.system('x')", "requests; python_version > '3'", "requests && rm -rf /", "$(id)",
                          "`id`", "req\nuests", "a b", "pkg==", "pkg[", "pkg (==1", "pkg==1 extra", "_pkg", "pkg-",
                          "p\xc3\xa9p", "pkg[a,]", "pkg>=1,", "pkg=1"})
    EXPECT_EQ(parse_requirement(bad, false).verdict, V::Malformed) << bad;
  EXPECT_EQ(parse_requirement("pkg @ https://example.com/pkg-1.0.whl", true).verdict, V::Ok);
  EXPECT_EQ(parse_requirement("pkg[x] @ git+https://example.com/pkg.git", true).verdict, V::Ok);
  EXPECT_EQ(parse_requirement("https://example.com/pkg.whl", true).verdict, V::Malformed) << "only name @ URL";
  EXPECT_EQ(parse_requirement("pkg @ https://x/y.whl; os_name=='nt'", true).verdict, V::Malformed);
  EXPECT_EQ(parse_requirement("--find-links=https://x", true).verdict, V::Forbidden) << "options stay refused";
  EXPECT_EQ(parse_requirement(std::string(201, 'a'), false).verdict, V::Malformed);
  EXPECT_EQ(parse_requirement(std::string(200, 'a'), false).verdict, V::Ok);
}

TEST(VenvRequirements, CanonicalText) {
  auto text = [](const char* s) { return parse_requirement(s, false).requirement.text(); };
  EXPECT_EQ(text("Requests"), "requests");
  EXPECT_EQ(text("Zope.Interface"), "zope-interface");
  EXPECT_EQ(text("foo__bar..baz"), "foo-bar-baz");
  EXPECT_EQ(text("requests[Socks, security] >= 2.31 , <3"), "requests[security,socks]<3,>=2.31");
  EXPECT_EQ(text("numpy (==1.26.4)"), "numpy==1.26.4");
  EXPECT_EQ(text("pkg==1.0RC1"), "pkg==1.0rc1");
  EXPECT_EQ(text("pkg>=1,>=1"), "pkg>=1");
  EXPECT_EQ(parse_requirement("Pkg[X] @ https://e.test/p.whl", true).requirement.text(), "pkg[x] @ https://e.test/p.whl");
}

TEST(VenvRequirements, GatherTakesLettasTwoShapes) {
  const json config = json::parse(R"([{"name": "requests", "version": "2.32.3"}, {"name": "numpy"},
                                      {"name": "rich", "version": null}, "httpx>=0.27"])");
  auto g = tsb::venv::gather(&config, {"pydantic", "numpy", "httpx>=0.27"});
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_EQ(*g, (std::vector<std::string>{"requests==2.32.3", "numpy", "rich", "httpx>=0.27", "pydantic"}));
  EXPECT_TRUE(tsb::venv::gather(nullptr, {})->empty());
  const json null = nullptr;
  EXPECT_EQ(*tsb::venv::gather(&null, {"x"}), std::vector<std::string>{"x"});
  for (const char* bad : {R"({"name": "x"})", R"([1])", R"([{"version": "1"}])", R"([{"name": 3}])", R"([{"name": "x", "version": 1}])"}) {
    const json j = json::parse(bad);
    auto g2 = tsb::venv::gather(&j, {});
    ASSERT_FALSE(g2.ok()) << bad;
    EXPECT_EQ(g2.error().code, EINVAL) << bad;
    EXPECT_EQ(g2.error().message.rfind("pip_requirements", 0), 0u) << bad;
  }
}

TEST(VenvRequirements, SetMergesSortsAndRefuses) {
  auto s = canonical_set({"Requests>=2", "numpy==1.26.4", "requests[socks]<3", "REQUESTS"});
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(s->text(), "numpy==1.26.4\nrequests[socks]<3,>=2\n");
  auto bad = canonical_set({"requests", "x; sys_platform=='linux'"});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, EINVAL);
  EXPECT_NE(bad.error().message.find("environment markers"), std::string::npos) << bad.error().message;
  auto url = canonical_set({"pkg @ https://e.test/p.whl"});
  ASSERT_FALSE(url.ok());
  EXPECT_EQ(url.error().code, tsb::venv::kUrlRefused);
  EXPECT_NE(url.error().message.find("\"pkg @ https://e.test/p.whl\""), std::string::npos) << url.error().message;
  EXPECT_EQ(canonical_set({"pkg @ https://e.test/p.whl"}, true)->text(), "pkg @ https://e.test/p.whl\n");
  auto option = canonical_set({"--index-url=https://e.test/"}, true);
  ASSERT_FALSE(option.ok());
  EXPECT_EQ(option.error().code, EPERM);
  auto twice = canonical_set({"pkg @ https://e.test/p.whl", "pkg"}, true);
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.error().code, EINVAL);
  ASSERT_TRUE(canonical_set({}).ok());
  EXPECT_EQ(canonical_set({})->text(), "");
}

TEST(VenvRequirements, AllowPatterns) {
  auto r = canonical_set({"requests", "Zope.Interface", "numpy"});
  ASSERT_TRUE(r.ok());
  const auto& s = *r;
  EXPECT_EQ(tsb::venv::first_not_allowed(s, {"*"}), "");
  EXPECT_EQ(tsb::venv::first_not_allowed(s, {"requests", "numpy", "zope_*"}), "");
  EXPECT_EQ(tsb::venv::first_not_allowed(s, {"requests", "zope-*"}), "numpy");
  EXPECT_EQ(tsb::venv::first_not_allowed(s, {}), "numpy");
  EXPECT_EQ(tsb::venv::first_not_allowed(s, {"Requests", "NUMPY"}), "zope-interface");
}

TEST(VenvRequirements, KeyNamesTheContent) {
  using tsb::venv::venv_key;
  const auto a = *canonical_set({"requests>=2", "numpy"}), b = *canonical_set({"NumPy", "requests >= 2"});
  EXPECT_EQ(venv_key("/usr/bin/python3", "wheels:/srv/wheels", a), venv_key("/usr/bin/python3", "wheels:/srv/wheels", b));
  EXPECT_EQ(venv_key("/usr/bin/python3", "", a).size(), 64u);
  EXPECT_NE(venv_key("/usr/bin/python3", "", a), venv_key("/usr/bin/python3.11", "", a));
  EXPECT_NE(venv_key("/usr/bin/python3", "", a), venv_key("/usr/bin/python3", "index:https://pypi.test/simple", a));
  EXPECT_NE(venv_key("/usr/bin/python3", "", a), venv_key("/usr/bin/python3", "", *canonical_set({"requests>=2"})));
  EXPECT_NE(venv_key("/usr/bin/python3", "", a), venv_key("/usr/bin/python3", "", *canonical_set({"requests>2", "numpy"})));
}

}  // namespace
