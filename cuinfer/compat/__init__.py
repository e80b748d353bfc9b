"""Drop-in compatibility modules."""
