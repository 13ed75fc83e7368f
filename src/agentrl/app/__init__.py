"""The application: what a user runs (`agentrl up | loop | report`), composed of the services below."""
