check broken.json default.json names-broken.json
