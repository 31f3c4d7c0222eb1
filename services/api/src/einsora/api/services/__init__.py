"""The api's domain: plain functions over the store, one module per noun, called by the routers."""
