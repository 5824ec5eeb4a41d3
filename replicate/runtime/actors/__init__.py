"""The asynchronous actor-learner regime, built on the loop: actor threads and the queue that
feeds the learners (``pool``), the point-to-point traffic between actor and learner processes
(``link``), and ``ActorLearner`` itself (``learner``)."""
