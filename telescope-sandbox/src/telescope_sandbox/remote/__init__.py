"""Remote sandbox providers (e2b, modal, daytona, prime), one module each.

Each is written against its SDK's public, synchronous API, imports the SDK only
when the provider is instantiated, and raises an error naming the extra to install
(``pip install 'telescope-sandbox[e2b]'``, ...) when it is missing. Limits are
passed to the service where its API takes them; the service enforces them.
"""
