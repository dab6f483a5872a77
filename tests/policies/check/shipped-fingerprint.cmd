@shipped fingerprint *.json
