"""The Responses API: POST /v3/responses (and /v1) over HTTP (routes.py) and in
WebSocket mode (socket.py); its request (protocol.py), how a request is made ready to
run (prepare.py), its events (events.py) and objects (body.py), and stored responses
(store.py)."""
