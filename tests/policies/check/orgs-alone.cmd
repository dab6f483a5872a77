check organizations.json
