def add(a: int, b: int) -> int:
    """Adds two numbers (a Letta-style tool: one function, JSON arguments)."""
    print(f"adding {a} and {b}")
    return a + b
