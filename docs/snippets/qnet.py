import numpy as np
import kilnet as kn

g = kn.Graph("qnet")
bars = g.input("bars", (40, 12))                  # per-sample shape; the batch is a compile parameter
h = kn.conv1d(bars, filters=32, window=3, step=1, activation="leaky_relu")
h = kn.dense(h, 1000, activation="tanh")          # dense flattens what it is given
g.output("probs", kn.softmax(kn.dense(h, 45), heads=3))   # 3 softmax heads of 15
x = np.random.rand(64, 40, 12).astype(np.float32)          # a batch of 64 samples
y = np.zeros((64, 45), np.float32); y[:, [0, 15, 30]] = 1
