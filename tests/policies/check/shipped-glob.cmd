@shipped check *.json
