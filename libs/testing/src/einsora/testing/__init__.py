"""Test machinery for Einsora's own tests and benchmarks: not shipped with any service.

`agent` plays the control plane to a real agent (its bus, its desired states); `guest` builds the
tiny VM guest and container root filesystems the engine tiers boot; `engines` starts and cleans
up libvirtd and dockerd for them; `pytest_engines` is the engine tier's pytest plugin (its
fixtures). Installed in the workspace's development environment only (issue 37): an agent
installed on a machine carries none of it, and no pytest plugin.
"""
