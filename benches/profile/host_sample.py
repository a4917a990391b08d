# gdb/cuda-gdb Python script: sample every thread's stack of an attached process.
# Usage: cuda-gdb -p PID -batch -nx -x host_sample.py   (env: SAMPLES, INTERVAL_S, SAMPLE_OUT)
import os, subprocess, gdb

samples = int(os.environ.get("SAMPLES", "100"))
interval = float(os.environ.get("INTERVAL_S", "0.05"))
out = open(os.environ.get("SAMPLE_OUT", "samples.txt"), "w")
pid = gdb.selected_inferior().pid
gdb.execute("set pagination off")
gdb.execute("set print frame-arguments none")
gdb.execute("handle SIGINT stop print nopass")
for name in ("SIGUSR1", "SIGUSR2", "SIGPIPE", "SIGCHLD", "SIG32", "SIG33", "SIG34"):
    try:
        gdb.execute("handle %s nostop noprint pass" % name)
    except gdb.error:
        pass
for i in range(samples):
    subprocess.Popen(["sh", "-c", "sleep %s; kill -INT %d" % (interval, pid)])
    try:
        gdb.execute("continue", to_string=True)
    except gdb.error as e:
        out.write("=== end: %s\n" % e)
        break
    out.write("=== sample %d\n" % i)
    out.write(gdb.execute("thread apply all bt 48", to_string=True))
    out.flush()
out.close()
try:
    gdb.execute("detach")
except gdb.error:
    pass
