"""The rollout fleet: generation engines (`rollout.engine`), the lease/generate/score/submit loop and its gRPC
service. Workers are stateless and scale by count; see ARCHITECTURE.md."""
