"""The public API's routes, one Powertools ``Router`` per resource, composed in ``berth.handlers.api``."""
