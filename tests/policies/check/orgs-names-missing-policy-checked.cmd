check default.json tools.json names-gpu.json
