"""What drives OpenVINO, below everything that knows the model: which engine backend serves
it and what that can do (backend.py), the binding made safe from several threads
(binding.py), token ids as the engine takes them (tensors.py), and what an engine exception
says in words a client may read (errors.py)."""
