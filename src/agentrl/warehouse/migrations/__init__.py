"""Numbered SQL migrations, one file per table (package data)."""
