"""What this machine builds with: its compilers and CUDA toolkits (toolchain), cmake (cmake),
the torch an environment holds (torch_probe), the Python environments a build installs into
(envs), the progress of a compile (progress) and what a build of given archs and size will
give and cost (foresight). Below doctor, overlay, verify and builds, which all ask it; above
workspace."""
