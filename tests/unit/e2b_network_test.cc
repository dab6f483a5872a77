// A policy's network as E2B takes it (daemon/policy/e2b_network.h): the
// mapping, the refusal of what E2B cannot run as written, where the loader
// and the policy set apply it, and the delegated organizations' policy.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "daemon/policy/e2b_network.h"
#include "daemon/policy/policy.h"
#include "daemon/policy/policy_explain.h"
#include "daemon/policy/registry.h"

namespace tsb::core {
namespace {

using nlohmann::json;

Policy egress(std::vector<EgressRules::Rule> allow, std::vector<std::uint16_t> public_ports = {}) {
  Policy p;
  p.name = "p";
  p.network = isolate::NetworkMode::Egress;
  p.egress.allow = std::move(allow);
  p.egress.public_ports = std::move(public_ports);
  return p;
}

TEST(E2BNetwork, NoneIsNoInternet) {
  Policy p;
  const E2BNetwork n = e2b_network(p);
  EXPECT_EQ(n.refusal, "");
  EXPECT_EQ(n.body, json({{"allow_internet_access", false}}));
  EXPECT_FALSE(n.body.contains("network"));
}

TEST(E2BNetwork, HostIsTheInternet) {
  Policy p;
  p.network = isolate::NetworkMode::Host;
  const E2BNetwork n = e2b_network(p);
  EXPECT_EQ(n.refusal, "");
  EXPECT_EQ(n.body, json({{"allow_internet_access", true}}));
}

TEST(E2BNetwork, EgressRulesBecomeAllowOutAndNothingWider) {
  const E2BNetwork n = e2b_network(egress({{{"api.example.com", "*.example.org"}, {443, 80}}, {{"a.test"}, {80, 443}}}));
  EXPECT_EQ(n.refusal, "");
  EXPECT_EQ(n.body, json::parse(R"({"allow_internet_access": false,
      "network": {"allowOut": ["*.example.org", "a.test", "api.example.com"], "denyOut": ["0.0.0.0/0"]}})"));
  EXPECT_EQ(n.digest.size(), 64u) << "SHA-256 in hex";
}

TEST(E2BNetwork, PublicIsTheNameWildcard) {
  const E2BNetwork n = e2b_network(egress({}, {80, 443}));
  EXPECT_EQ(n.refusal, "");
  EXPECT_EQ(n.body["network"]["allowOut"], json::array({"*"}));
  EXPECT_EQ(n.body["network"]["denyOut"], json::array({"0.0.0.0/0"}));
  EXPECT_EQ(n.body["allow_internet_access"], false);
}

TEST(E2BNetwork, EgressWithoutRulesReachesNothing) {
  const E2BNetwork n = e2b_network(egress({}));
  EXPECT_EQ(n.refusal, "");
  EXPECT_EQ(n.body, json::parse(R"({"allow_internet_access": false, "network": {"allowOut": [], "denyOut": ["0.0.0.0/0"]}})"));
}

TEST(E2BNetwork, OnePortOfTheTwoIsRefusedAsWider) {
  const E2BNetwork n = e2b_network(egress({{{"a.test"}, {80, 443}}, {{"api.example.com"}, {443}}}));
  EXPECT_EQ(n.refused_at, "/egress/allow/1/ports");
  EXPECT_EQ(n.refusal,
            "egress allow[1] (hosts \"api.example.com\", ports 443) cannot run on E2B as written: E2B allows a "
            "destination by name on ports 80 and 443 together, never one of them alone, so port 80 would be open "
            "too, wider than the rule (give it ports 80 and 443)");
  EXPECT_TRUE(n.body.is_null()) << "nothing to send";
  EXPECT_EQ(n.digest, "");
}

TEST(E2BNetwork, OtherPortsAreRefused) {
  const E2BNetwork n = e2b_network(egress({{{"db.example.com"}, {80, 443, 5432}}}));
  EXPECT_EQ(n.refused_at, "/egress/allow/0/ports");
  EXPECT_EQ(n.refusal,
            "egress allow[0] (hosts \"db.example.com\", ports 80, 443, 5432) cannot run on E2B: E2B allows a "
            "destination by name only on ports 80 (HTTP, by its Host header) and 443 (TLS, by its SNI), so port "
            "5432 would be refused there (give it ports 80 and 443)");
  const E2BNetwork pub = e2b_network(egress({}, {443}));
  EXPECT_EQ(pub.refused_at, "/egress/public/ports");
  EXPECT_NE(pub.refusal.find("egress public (ports 443) cannot run on E2B as written"), std::string::npos) << pub.refusal;
}

TEST(E2BNetwork, DifferentRulesHaveDifferentDigests) {
  const std::string a = e2b_network(egress({{{"a.test"}, {80, 443}}})).digest;
  const std::string b = e2b_network(egress({{{"b.test"}, {80, 443}}})).digest;
  const std::string pub = e2b_network(egress({}, {80, 443})).digest;
  Policy none, host;
  host.network = isolate::NetworkMode::Host;
  EXPECT_EQ(a, e2b_network(egress({{{"a.test"}, {443, 80}}})).digest) << "the same rules, the same sandboxes";
  EXPECT_NE(a, b);
  EXPECT_NE(a, pub);
  EXPECT_NE(e2b_network(none).digest, e2b_network(host).digest);
  EXPECT_NE(e2b_network(none).digest, e2b_network(egress({})).digest);
}

// A policy file in a temporary directory.
struct PolicyFile {
  std::string dir, path;
  explicit PolicyFile(const std::string& text) {
    char tmpl[] = "/tmp/tsb-e2bnet-XXXXXX";
    if (const char* d = ::mkdtemp(tmpl)) dir = d;
    path = dir + "/remote.json";
    std::ofstream(path) << text;
  }
  ~PolicyFile() {
    ::unlink(path.c_str());
    ::rmdir(dir.c_str());
  }
};

TEST(E2BNetwork, LoaderRefusesABackendE2BPolicyWithItsPosition) {
  PolicyFile f(
      "{\"version\": 1, \"backend\": \"e2b\", \"filesystem\": {\"venv\": null},\n"
      " \"network\": \"egress\",\n"
      " \"egress\": {\"allow\": [{\"hosts\": [\"api.example.com\"],\n"
      "                          \"ports\": [443]}]}}\n");
  PolicyContext ctx;
  ctx.compile = false;
  auto r = load_policy(f.path, ctx);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message,
            "policy: " + f.path + ":4:36: backend \"e2b\": egress allow[0] (hosts \"api.example.com\", ports 443) "
            "cannot run on E2B as written: E2B allows a destination by name on ports 80 and 443 together, never one "
            "of them alone, so port 80 would be open too, wider than the rule (give it ports 80 and 443)");
  // The same rules, local: the daemon's proxy enforces ports.
  PolicyFile local(
      "{\"version\": 1, \"filesystem\": {\"venv\": null}, \"network\": \"egress\",\n"
      " \"egress\": {\"allow\": [{\"hosts\": [\"api.example.com\"], \"ports\": [443]}]}}\n");
  EXPECT_TRUE(load_policy(local.path, ctx).ok());
}

// ---------------------------------------------------------------------------
// The shipped set: delegated organizations get e2b.json on E2B, and keep
// default.json (no network) locally.

class Delegated : public testing::Test {
 protected:
  void SetUp() override {
    DaemonConfig cfg;  // the embedded policies and organizations
    auto set = load_policy_set(cfg);
    ASSERT_TRUE(set.ok()) << set.error().message;
    set_ = *set;
  }
  std::shared_ptr<const PolicySet> set_;
};

TEST_F(Delegated, ShippedSetLoadsWithE2BConfigured) {
  DaemonConfig cfg;
  cfg.e2b.enabled = true;
  auto set = load_policy_set(cfg);
  ASSERT_TRUE(set.ok()) << set.error().message;
}

TEST_F(Delegated, ShippedE2BPolicyIsHttpAndHttpsToPublicHosts) {
  const Policy& p = *set_->policies.at("e2b");
  EXPECT_EQ(p.backend, Backend::E2B);
  EXPECT_EQ(e2b_network(p).body, json::parse(R"({"allow_internet_access": false,
      "network": {"allowOut": ["*"], "denyOut": ["0.0.0.0/0"]}})"));
  EXPECT_EQ(set_->orgs.fallback.e2b_policy, "e2b");
  EXPECT_EQ(set_->orgs.fallback.allowed_policies, std::vector<std::string>{"default"})
      << "a request cannot name it locally";
  // The page says what an E2B sandbox of it may reach.
  const std::string page = explain_policy(p, ExplainOptions{});
  EXPECT_NE(page.find("\nOn E2B (backend \"e2b\": every run of this policy"), std::string::npos) << page;
  EXPECT_NE(page.find("by name, on TCP ports 80 (HTTP Host header) and 443 (TLS SNI) only: any name"), std::string::npos);
}

TEST_F(Delegated, DelegatedRunsGetTheE2BPolicyAndLocalRunsTheDefault) {
  auto e2b = place_run(*set_, "org-any", std::nullopt, true);
  ASSERT_TRUE(e2b.ok()) << e2b.error().message;
  EXPECT_EQ(e2b->policy->name, "e2b");
  EXPECT_EQ(e2b->backend, Backend::E2B);
  auto local = place_run(*set_, "org-any", std::nullopt, false);
  ASSERT_TRUE(local.ok()) << local.error().message;
  EXPECT_EQ(local->policy->name, "default");
  EXPECT_EQ(local->backend, Backend::Local);
  EXPECT_EQ(local->policy->network, isolate::NetworkMode::None);
  // Named, it is refused: not among allowed_policies.
  auto named = place_run(*set_, "org-any", std::string("e2b"), false);
  ASSERT_FALSE(named.ok());
  EXPECT_EQ(named.error().code, EPERM);
  // A request that names its allowed policy keeps it on E2B too.
  auto asked = place_run(*set_, "org-any", std::string("default"), true);
  ASSERT_TRUE(asked.ok()) << asked.error().message;
  EXPECT_EQ(asked->policy->name, "default");
  EXPECT_EQ(asked->backend, Backend::E2B);
}

TEST(DelegatedCheck, APolicyE2BCannotRunIsRefusedWhenE2BIsConfigured) {
  auto narrow = std::make_shared<Policy>(egress({{{"api.example.com"}, {443}}}));
  narrow->name = "narrow";
  narrow->source = "/etc/p/narrow.json";
  std::map<std::string, std::shared_ptr<const Policy>> policies = {{"narrow", narrow},
                                                                   {"default", std::make_shared<Policy>()}};
  Organizations orgs;
  orgs.source = "/etc/p/organizations.json";
  orgs.fallback = OrgEntry{};
  orgs.orgs["org-t"] = OrgEntry{true, "narrow", {"narrow"}, ""};  // privileged: never on E2B
  EXPECT_TRUE(check_delegated_policies(orgs, policies).ok());
  orgs.orgs["org-u"] = OrgEntry{false, "default", {"default", "narrow"}, ""};
  auto st = check_delegated_policies(orgs, policies);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().message,
            "E2B: /etc/p/organizations.json: organization \"org-u\" is delegated to E2B (not privileged, E2B "
            "configured) and may run under policy \"narrow\", which E2B cannot run: /etc/p/narrow.json: "
            "/egress/allow/0/ports: egress allow[0] (hosts \"api.example.com\", ports 443) cannot run on E2B as "
            "written: E2B allows a destination by name on ports 80 and 443 together, never one of them alone, so "
            "port 80 would be open too, wider than the rule (give it ports 80 and 443)");
  // Its e2b_policy must be loaded.
  orgs.orgs.erase("org-u");
  orgs.fallback.e2b_policy = "ghost";
  auto ghost = check_delegated_policies(orgs, policies);
  ASSERT_FALSE(ghost.ok());
  EXPECT_EQ(ghost.error().message,
            "E2B: /etc/p/organizations.json: the default entry is delegated to E2B and names policy \"ghost\", "
            "which is not loaded");
}

}  // namespace
}  // namespace tsb::core
