check unknown-key.json
