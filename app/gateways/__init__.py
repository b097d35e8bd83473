"""Gateway adapters, one module per gateway; ``app.gateways.registry`` declares which there are."""
