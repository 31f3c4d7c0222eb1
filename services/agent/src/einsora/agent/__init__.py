"""Einsora agent: inventory, drivers and sync for one machine.

It installs alone on a GPU host (`pip install ./libs/common ./services/agent`) and imports no
server dependency. It is an untrusted client of the bus: it reads only its own desired key and
writes only its own observed and inventory keys.
"""
