fingerprint organizations.json tools.json
