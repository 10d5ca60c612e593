"""What this machine builds with: its compilers and CUDA toolkits (toolchain), the Python
environments a build installs into (envs), and the progress of a compile (progress). Below
doctor, overlay, verify and build, which all ask it; above workspace."""
