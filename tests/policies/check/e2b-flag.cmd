check --e2b e2b-narrow.json e2b-web.json
