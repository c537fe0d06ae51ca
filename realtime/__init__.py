"""The Realtime protocol core, shared by the server (``pipeline``) and the client (``voxloop.client``).

Sans-I/O: frames in, validated event dataclasses out, and back. It imports only voxloop's base
modules (``base.config``, ``base.errors``): no engine, no server code.
"""
