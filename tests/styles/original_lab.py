import argparse
import os
import time

import torch
import torch.nn as nn
import torchvision
import torchvision.transforms as transforms

import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler

# Parse input arguments
parser = argparse.ArgumentParser(description='Fashion MNIST PyTorch Example',
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument('--batch-size', type=int, default=32,
                    help='input batch size for training')
parser.add_argument('--epochs', type=int, default=40,
                    help='number of epochs to train')
parser.add_argument('--base-lr', type=float, default=0.01,
                    help='learning rate for a single GPU')
parser.add_argument('--target-accuracy', type=float, default=.85,
                    help='Target accuracy to stop training')
parser.add_argument('--patience', type=int, default=2,
                    help='Number of epochs that meet target before stopping')
parser.add_argument('--data-dir', type=str, default='./data',
                    help='Where the Fashion-MNIST files are (or will be downloaded to)')
parser.add_argument('--widen-factor', type=int, default=10,
                    help='Widen factor of the WideResNet')
parser.add_argument('--num-nodes', type=int, default=1,
                    help='Number of available nodes/hosts')
parser.add_argument('--node-id', type=int, default=0,
                    help='Unique ID to identify the current node/host')
parser.add_argument('--num-gpus', type=int, default=1,
                    help='Number of GPUs in each node')
parser.add_argument('--master-addr', type=str, default='localhost',
                    help='Address of the node with rank 0')
parser.add_argument('--master-port', type=int, default=29500,
                    help='Free port on the node with rank 0')
parser.add_argument('--sync-bn', action='store_true',
                    help='Use SyncBatchNorm (GPUs only)')
args = parser.parse_args()

WORLD_SIZE = args.num_gpus * args.num_nodes

os.environ['MASTER_ADDR'] = args.master_addr
os.environ['MASTER_PORT'] = str(args.master_port)


# Standard convolution block followed by batch normalization and a ReLU
class cbrblock(nn.Module):
    def __init__(self, input_channels, output_channels):
        super(cbrblock, self).__init__()
        self.cbr = nn.Sequential(nn.Conv2d(input_channels, output_channels, kernel_size=3,
                                           stride=(1, 1), padding='same', bias=False),
                                 nn.BatchNorm2d(output_channels),
                                 nn.ReLU())

    def forward(self, x):
        out = self.cbr(x)
        return out


# Basic residual block
class conv_block(nn.Module):
    def __init__(self, input_channels, output_channels, scale_input):
        super(conv_block, self).__init__()
        self.scale_input = scale_input
        if self.scale_input:
            self.scale = nn.Conv2d(input_channels, output_channels, kernel_size=1,
                                   stride=(1, 1), padding='same')
        self.layer1 = cbrblock(input_channels, output_channels)
        self.dropout = nn.Dropout(p=0.01)
        self.layer2 = cbrblock(output_channels, output_channels)

    def forward(self, x):
        residual = x
        out = self.layer1(x)
        out = self.dropout(out)
        out = self.layer2(out)
        if self.scale_input:
            residual = self.scale(residual)
        out = out + residual
        return out


# Overall network
class WideResNet(nn.Module):
    def __init__(self, num_classes=10, widen_factor=10):
        super(WideResNet, self).__init__()
        nChannels = [1, 16, 16 * widen_factor, 32 * widen_factor, 64 * widen_factor]

        self.input_block = cbrblock(nChannels[0], nChannels[1])

        # Module with alternating components employing input scaling
        self.block1 = conv_block(nChannels[1], nChannels[2], 1)
        self.block2 = conv_block(nChannels[2], nChannels[2], 0)
        self.pool1 = nn.MaxPool2d(2)
        self.block3 = conv_block(nChannels[2], nChannels[3], 1)
        self.block4 = conv_block(nChannels[3], nChannels[3], 0)
        self.pool2 = nn.MaxPool2d(2)
        self.block5 = conv_block(nChannels[3], nChannels[4], 1)
        self.block6 = conv_block(nChannels[4], nChannels[4], 0)

        # Global average pooling
        self.pool = nn.AdaptiveAvgPool2d(1)

        # Feature flattening followed by linear layer
        self.flat = nn.Flatten()
        self.fc = nn.Linear(nChannels[4], num_classes)

    def forward(self, x):
        out = self.input_block(x)
        out = self.block1(out)
        out = self.block2(out)
        out = self.pool1(out)
        out = self.block3(out)
        out = self.block4(out)
        out = self.pool2(out)
        out = self.block5(out)
        out = self.block6(out)
        out = self.pool(out)
        out = self.flat(out)
        out = self.fc(out)
        return out


def train(model, optimizer, train_loader, loss_fn, device):
    total_labels = 0
    model.train()
    for images, labels in train_loader:
        images = images.to(device)
        labels = labels.to(device)
        outputs = model(images)
        loss = loss_fn(outputs, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total_labels += len(labels)
    return total_labels


def test(model, test_loader, loss_fn, device, global_rank):
    # Returns this rank's loss sum, number of correct labels and number of labels.
    # The DistributedSampler pads the shards so that they have equal length: the i-th image
    # of this rank is entry i * WORLD_SIZE + global_rank of the padded list, and the entries
    # past the end of the test set are repeats, which must not be counted twice.
    total_labels = torch.zeros(1, device=device)
    correct_labels = torch.zeros(1, device=device)
    loss_total = torch.zeros(1, device=device)
    num_images = len(test_loader.dataset)
    seen = 0
    model.eval()
    with torch.no_grad():
        for images, labels in test_loader:
            images = images.to(device)
            labels = labels.to(device)
            outputs = model(images)
            positions = (seen + torch.arange(len(labels), device=device)) * WORLD_SIZE + global_rank
            real = positions < num_images
            seen += len(labels)
            predictions = torch.max(outputs, 1)[1]
            loss_total += loss_fn(outputs, labels)[real].sum()
            correct_labels += (predictions == labels)[real].sum()
            total_labels += real.sum()
    return loss_total, correct_labels, total_labels


def worker(local_rank, args):
    global_rank = args.node_id * args.num_gpus + local_rank
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device('cuda:' + str(local_rank))
        backend = 'nccl'
    else:
        device = torch.device('cpu')
        backend = 'gloo'
    dist.init_process_group(backend=backend, world_size=WORLD_SIZE, rank=global_rank)

    # Load and transform the data; one download per node
    transform = transforms.Compose([transforms.ToTensor()])
    download = True if local_rank == 0 else False
    if local_rank == 0:
        train_set = torchvision.datasets.FashionMNIST(args.data_dir, train=True, download=download,
                                                      transform=transform)
        test_set = torchvision.datasets.FashionMNIST(args.data_dir, train=False, download=download,
                                                     transform=transform)
    dist.barrier()
    if local_rank != 0:
        train_set = torchvision.datasets.FashionMNIST(args.data_dir, train=True, download=download,
                                                      transform=transform)
        test_set = torchvision.datasets.FashionMNIST(args.data_dir, train=False, download=download,
                                                     transform=transform)

    train_sampler = DistributedSampler(train_set, num_replicas=WORLD_SIZE, rank=global_rank)
    test_sampler = DistributedSampler(test_set, num_replicas=WORLD_SIZE, rank=global_rank, shuffle=False)
    train_loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size, shuffle=False,
                                               sampler=train_sampler)
    test_loader = torch.utils.data.DataLoader(test_set, batch_size=args.batch_size, shuffle=False,
                                              sampler=test_sampler)

    # Create the model and move to GPU device if available
    num_classes = 10
    model = WideResNet(num_classes, widen_factor=args.widen_factor).to(device)
    if args.sync_bn and torch.cuda.is_available():
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if torch.cuda.is_available():
        model = DDP(model, device_ids=[local_rank])
    else:
        model = DDP(model)

    # Define loss function (per image: the test sums it) and optimizer
    loss_fn = nn.CrossEntropyLoss(reduction='none')
    optimizer = torch.optim.SGD(model.parameters(), lr=args.base_lr)

    def mean_loss(outputs, labels):
        return loss_fn(outputs, labels).mean()

    val_accuracy = []
    start_time = time.time()
    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        t0 = time.time()
        images_trained = train(model, optimizer, train_loader, mean_loss, device)
        dist.barrier()
        epoch_time = time.time() - t0

        images_per_sec = torch.tensor(images_trained / epoch_time, device=device)
        dist.reduce(images_per_sec, 0, op=dist.ReduceOp.SUM)

        v_loss_total, v_correct, v_labels = test(model, test_loader, loss_fn, device, global_rank)
        dist.all_reduce(v_loss_total, op=dist.ReduceOp.SUM)
        dist.all_reduce(v_correct, op=dist.ReduceOp.SUM)
        dist.all_reduce(v_labels, op=dist.ReduceOp.SUM)
        v_loss = (v_loss_total / v_labels).item()
        v_accuracy = (v_correct / v_labels).item()
        val_accuracy.append(v_accuracy)

        if global_rank == 0:
            print("Epoch = {}: Cumulative Time = {:.0f}, Epoch Time = {:.2f}, Images/sec = {:.1f}, "
                  "Validation Loss = {:.3f}, Validation Accuracy = {:.3f}".format(
                      epoch + 1, time.time() - start_time, epoch_time, images_per_sec.item(),
                      v_loss, v_accuracy), flush=True)

        # Early stopping: every rank has the same accuracies, so every rank stops together
        if len(val_accuracy) >= args.patience and all(
                acc >= args.target_accuracy for acc in val_accuracy[-args.patience:]):
            if global_rank == 0:
                print('Early stopping after epoch {}'.format(epoch + 1))
            break

    dist.destroy_process_group()


if __name__ == '__main__':
    mp.spawn(worker, nprocs=args.num_gpus, args=(args,))
