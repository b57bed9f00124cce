"""The capstone (notebook 40): a new model and data set, trained to a target quality as fast as the learner can, under rules like MLPerf Training's."""
