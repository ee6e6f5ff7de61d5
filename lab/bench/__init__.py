"""`make bench` and the measurements on a GPU machine: each module a script, run as
``python -m lab.bench.<name>`` from the project folder; their recorded results stay in bench/."""
