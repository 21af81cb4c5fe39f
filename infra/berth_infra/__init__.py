"""Berth's CDK app: the one CloudFormation template that goes to AWS and into the local cloud."""
