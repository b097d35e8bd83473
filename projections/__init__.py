"""PostgreSQL read models: numbered forward-only migrations and the writers that fill them."""
