lint tenants.json tools.json
