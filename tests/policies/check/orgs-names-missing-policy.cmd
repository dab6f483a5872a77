check names-gpu.json
