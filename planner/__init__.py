"""Pure-NumPy work planner (imports nothing but numpy)."""
