"""A handler module that cannot be imported (the runtime's init-error test)."""

raise ImportError("this module is broken on purpose")
