check default.json tools.json organizations.json
