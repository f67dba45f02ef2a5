"""Virtual-time evaluation of the hub against simulated scenarios (`gpuscope sim-eval`)."""
