"""SPO's annotation tools: Q0 estimation from reference samples, and Pivotal Token Search."""
