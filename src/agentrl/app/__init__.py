"""The application: what a user runs (`agentrl up | loop | soak | report`), composed of the services below."""
