check e2b-narrow.json e2b-web.json
