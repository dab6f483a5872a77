explain organizations.json
