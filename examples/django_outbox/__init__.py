"""A tiny Django project whose orders and their confirmation tasks commit together (see app.py)."""
