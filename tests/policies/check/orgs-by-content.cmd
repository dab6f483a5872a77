check tenants.json
