"""The programs that run inside the cluster's pods: the admission proxy in front of a router, the
model downloaders and the router's library keeper. Each file here is shipped as it is, as a file of
the server's programs ConfigMap (components/programs.py), and run as a script by the pinned Python
image (`python3 admission_proxy.py`): so these modules import only the standard library, each other
by their plain module names, and the HTTP implementation shipped beside them (h11). A test
(tests/test_layering.py) holds them to that. The program imports one of them, fit.py, so that the
planner and the proxy decide what may be resident with the same function."""
