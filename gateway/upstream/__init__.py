"""Upstream model servers: the clients, the lean HTTP wire, model-name routing, and tokens-in."""
