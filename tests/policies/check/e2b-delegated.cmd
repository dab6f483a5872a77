check --e2b default.json e2b-narrow.json e2b-web.json e2b-delegated.json
