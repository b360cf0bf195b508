"""The Responses API: POST /v3/responses (and /v1) over HTTP (routes.py) and in
WebSocket mode (socket.py); its request (protocol.py), how a request is made ready to
run (prepare.py) and run, stored before the client hears it ended (running.py), its
output laid out as typed items and events (events.py, objects.py) ending in the Response
object (body.py), and stored responses (store.py)."""
