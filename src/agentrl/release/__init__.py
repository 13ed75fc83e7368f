"""The release path: what decides which model version serves."""
