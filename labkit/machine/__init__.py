"""What the machine allows: the heat guard and clean steps (`heat`), the CPU's free cores
(`cpuload`), what a run holds of a GPU and how runs share one (`memory`), and which GPU each
run goes to (`placement`)."""
