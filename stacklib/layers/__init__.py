"""Protocol layers, each a wire format, a sans-IO core and a trio driver.

Each layer registers itself with :mod:`stacklib.stack` when its module is imported; recipes
find the built-in ones through :mod:`stacklib.builtin`, so this package imports none of them
(importing one layer does not import them all).
"""
