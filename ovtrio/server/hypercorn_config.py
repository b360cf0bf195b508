# Hypercorn settings that make the `hypercorn` command as safe as `ovtrio serve`, which
# uses these same values:
#
#     hypercorn -k trio --config python:ovtrio.server.hypercorn_config ovtrio.app:app
#
# Hypercorn reads every attribute of this module as a setting (Config.from_object), so it
# holds settings only: no imports, no helpers. Flags given on the command line
# (`-b 0.0.0.0:8000`, `--keep-alive 5`) override them. The drain before Hypercorn stops
# listening needs no setting: the app arranges it when Hypercorn imports it
# (ovtrio/server/hypercorn_patches/drain.py).

worker_class = "trio"

# Connections the kernel queues before the server accepts them. Hypercorn's default
# (100) makes a burst of clients arriving at once wait for SYN retries (a second and
# more) or fail with a connect timeout; the kernel caps the value at
# net.core.somaxconn (4096 on current Linux).
backlog = 4096

# Seconds an idle keep-alive connection stays open (Hypercorn's default is 5): longer
# than the 60 s idle timeout of common load balancers and proxies, so they close first
# and never send a request on a connection the server is closing.
keep_alive_timeout = 75

# How long Hypercorn lets connections run on once its shutdown trigger has returned,
# before it cancels them. The trigger returns only after the drain, which has ended every
# request by then (finished, or cut with an error), so this covers writing their last
# bytes and closing; Hypercorn's default (3 s) is the same idea, with a little more room.
graceful_timeout = 5
