# Exercise 08.2: buckets with bucket_cap_mb=8 (8,388,608 bytes), gradients in backward's order, whole tensors,
# a bucket closed once it reaches its cap.
sizes = [1024 * 8 * 4 + 8 * 4, 1024 * 4, 1024 * 1024 * 4, 1024 * 4, 1024 * 1024 * 4]  # output, hidden b/w, input b/w
# cumulative: 32,800; 36,896; 4,231,200; 4,235,296; 8,429,600 >= 8,388,608 only after the last tensor
answer = 1  # one bucket: all-reduced after the input layer's gradient, nothing left to overlap
