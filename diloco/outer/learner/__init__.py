"""The learner's side: the learner (its fragments, copies, delivery rules and checkpoint form), its protocol as a sans-I/O machine, and the learner whose state is a row of a stack."""
