# Exercise 06.1: 4 nodes x 8 GPUs, every rank calls torch.cuda.set_device(int(os.environ["RANK"])).
# torchrun numbers node n's ranks n * 8 .. n * 8 + 7 (LOCAL_RANK 0..7), and every node's GPUs are 0..7.
# Node 0: RANK 0..7 name existing GPUs. Nodes 1, 2, 3: RANK 8..31 name indices no node has.
nodes, gpus_per_node = 4, 8
answer = (nodes - 1) * gpus_per_node  # 24 ranks; LOCAL_RANK would fit on every node
