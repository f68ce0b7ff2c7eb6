"""The transfer benchmark's Python peers, each run as a child process
(python <file> up|down ...) so its CPU and memory are its own."""
