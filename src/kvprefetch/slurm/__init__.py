"""Slurm campaigns: build, verify and bench as ``sbatch`` jobs with ``afterok`` dependencies
(campaign.py plans them, scripts.py writes them, cluster.py submits and watches them,
standin.py is the CPU-only stand-in bench shard)."""
