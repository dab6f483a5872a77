check default.json organizations.json
