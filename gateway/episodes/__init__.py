"""Episodes at the gateway: the registry of open episodes, call numbering across restarts, and
production sessions."""
